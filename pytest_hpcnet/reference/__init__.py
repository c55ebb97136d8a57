"""The reference implementation: transport, RPC, MapReduce and DFS that run on any Linux box."""
