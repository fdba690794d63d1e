"""Users of one shell: accounts and roles, passwords, sign-in sessions, personal tokens, OIDC
identities (docs/api.md "Users"; decisions.md "Users in one shell").

`model` is pure; `passwords` hashes off the event loop; `store` keeps the table in SQLite and the
lookups a request needs (session and token hashes) in memory.
"""
