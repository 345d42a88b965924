"""Model distribution I/O (docs/distribution.md).

- `fetcher`: the one HTTP range fetcher (stage hosts and the orchestrator's URL sources);
- `server`: the orchestrator's model server (HTTPS, mutual TLS from the cluster secret, Range);
- `cache`: a stage host's weights cache (sparse files, sidecar record of verified pieces, LRU);
- `stagefetch`: a stage's fetch of its ranges into the cache (shared, resumable, with progress);
- `job`: one fetch on its thread (its lanes and span queue, piece writer, recorder thread, progress meter);
- `connections`: a pool's kept-alive connections, opened ahead and handed from request to request;
- `request`: what a stage asks for (plain data for the StageController core).
"""
