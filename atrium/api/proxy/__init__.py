"""The proxy edge: every request the shell forwards to an app, and every answer it hands back.

Two paths, one set of rules: `data` (`/api/data/<authority>/…`, the hot path, raw ASGI) and
`pages` (an app's own origin and the user's `/api/proxy/…`). Both go over the shell's one
connection pool (`atrium.httppool`), filter headers through `headers` (hop-by-hop, those the
`Connection` header names, `X-Os-*` and the shell's credentials inbound; framing and `Date`
outbound), and differ only in the data of their `headers.Rules`.
"""
