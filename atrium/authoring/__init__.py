"""The app authors' kit: templates for `atrium new` (the contract check is `atrium.testing`)."""
