"""The wire: RESP, rounds, connections and nodes (TLS, ACL, Sentinel)."""
