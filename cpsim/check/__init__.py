"""The oracle: invariants over gathered slot mappings, and the reference they are judged against."""
