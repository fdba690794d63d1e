"""Existing OCI images as app content: the store that pulls, verifies and unpacks them
(`atrium.images.store`), the layer rules (`atrium.images.layers`) and the image config laid under
the manifest's ``runtime`` (`atrium.images.config`)."""
