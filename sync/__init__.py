"""Many hosts as one memory: CRDTs, the instance and its replication loop (to come)."""
