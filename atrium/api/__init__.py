"""The HTTP API: Starlette routes, one module per area; routes are thin glue over services."""
