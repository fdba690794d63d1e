"""Users of one shell: accounts and roles, passwords, sign-in sessions, personal tokens, OIDC
identities (docs/api.md "Users"; decisions.md "Users in one shell").

`model` is pure; `passwords` hashes off the event loop; `store` keeps the tables in the state
database and the lookups a request needs (session and token hashes) in memory; `carry` brings an
older home's SQLite files in once.
"""
