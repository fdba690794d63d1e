"""Theming: the theme model and catalogue, the selection (KV `os`/`theme`), the theme CSS and the
injection into app pages (spec "Theme", "ColorPalette", "Theme API", Theme rules 1-6).

Pure: `model`, `color`, `css`, `inject`. Services: `catalogue`, `prefs`.
"""
