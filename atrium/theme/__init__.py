"""Theming: the theme model and catalogue, the selection (KV `os`/`theme`), the theme CSS and the
injection into app pages (docs/api.md "Themes").

Pure: `model`, `color`, `css`, `inject`. Services: `catalogue`, `prefs`.
"""
