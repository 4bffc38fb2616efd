"""`trax-qkv-serve`: translation and attention maps over HTTP.

An optional part (`pip install 'trax_qkv[serve]'`, which adds aiohttp):
`batching` decodes the sentences of requests that arrive together in
shared batches, `app` is the HTTP API and `page.html` the page at `/`.
Nothing else in trax_qkv imports it.
"""
