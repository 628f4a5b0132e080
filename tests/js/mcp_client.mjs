// Drives a groundkit MCP server with the official TypeScript SDK client, for
// tests/test_mcp_typescript.py, which writes the plan and asserts on the output.
//
//   node mcp_client.mjs PLAN.json
//
// PLAN: {"transport": {"type": "stdio", "command", "args", "env", "cwd"}
//                   | {"type": "http", "url"},
//        "calls": [{"name", "arguments"}]}
// Prints one JSON object: the server's info, the listed tools, each call's
// result (or what the client threw) and, over HTTP, every response's status
// and X-Request-ID. The client is used as an application would use it:
// listTools() first (which makes callTool() check results against each
// tool's outputSchema), then callTool().

import { readFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { LATEST_PROTOCOL_VERSION } from "@modelcontextprotocol/sdk/types.js";

const plan = JSON.parse(readFileSync(process.argv[2], "utf8"));
const http = [];

function transportFor(spec) {
  if (spec.type === "stdio") {
    return new StdioClientTransport({
      command: spec.command,
      args: spec.args,
      env: spec.env,
      cwd: spec.cwd,
      stderr: "inherit",
    });
  }
  if (spec.type === "http") {
    // The SDK's own fetch, wrapped only to record what each response carried.
    const recordingFetch = async (url, init) => {
      const response = await fetch(url, init);
      http.push({
        method: (init && init.method) || "GET",
        status: response.status,
        requestId: response.headers.get("x-request-id"),
        contentType: response.headers.get("content-type"),
        allow: response.headers.get("allow"),
      });
      return response;
    };
    return new StreamableHTTPClientTransport(new URL(spec.url), { fetch: recordingFetch });
  }
  throw new Error(`unknown transport type ${spec.type}`);
}

function thrown(error) {
  return { name: error?.constructor?.name ?? typeof error, message: String(error?.message ?? error), code: error?.code ?? null };
}

const client = new Client({ name: "groundkit-typescript-test", version: "0.0.0" });
const out = { sdkProtocolVersion: LATEST_PROTOCOL_VERSION, calls: [], http };
try {
  await client.connect(transportFor(plan.transport));
  out.server = client.getServerVersion();
  out.instructions = client.getInstructions() ?? null;
  out.tools = (await client.listTools()).tools;
  for (const call of plan.calls) {
    const entry = { name: call.name, arguments: call.arguments };
    try {
      entry.result = await client.callTool({ name: call.name, arguments: call.arguments });
      entry.threw = false;
    } catch (error) {
      entry.threw = true;
      entry.error = thrown(error);
    }
    out.calls.push(entry);
  }
} catch (error) {
  out.fatal = thrown(error);
} finally {
  await client.close().catch(() => {});
}
process.stdout.write(JSON.stringify(out) + "\n");
process.exit(out.fatal ? 1 : 0);
