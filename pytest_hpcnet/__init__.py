"""pytest-hpcnet: correctness and speed-up checks for big-data stacks on fast networks."""

__version__ = "0.1.0"
