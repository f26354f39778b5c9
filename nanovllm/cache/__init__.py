"""The cache a decoder layer needs, described below every tier that reads it.

`models/` says which cache each layer needs (`specs`), `layers/` runs on the
view of it that it is handed, and `worker/` sizes and binds the caches; this
package imports none of them.
"""
