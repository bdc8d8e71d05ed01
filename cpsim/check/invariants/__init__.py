"""The oracle's invariants (docs/SPEC.md §4), a module per group of related ones."""
