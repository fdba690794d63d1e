"""Distribution: refs, resolve → fetch → validate → permission diff → install; update, uninstall,
the index, publish (docs/api.md "Distribution")."""
