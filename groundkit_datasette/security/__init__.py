"""Security decisions every layer may use: the instance boundary (loopback socket, Host and
Origin, "published means authenticated", security headers, secrets kept out of metadata),
authentication (static tokens, OIDC), and the outbound URL guard for model endpoints.
May import only the shared modules; it is given the settings rather than reading them.
"""
