"""Pulse's read side: folds the event log into DuckDB tables, FAISS indexes and a
full-text index, with checkpoints, rebuild, digest and the queries the API calls."""
