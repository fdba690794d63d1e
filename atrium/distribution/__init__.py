"""Distribution: refs, resolve → fetch → validate → permission diff → install; update, uninstall,
the index, publish (spec "Distribution API", "Install pipeline stages")."""
