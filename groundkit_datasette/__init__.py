"""groundkit-datasette: explore and cite a private document corpus through Datasette."""

__version__ = "0.1.0"
