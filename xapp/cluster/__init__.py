"""Scale-out of the xApp by E2 node (issue 46): the ownership rules (``ownership``, pure) and
their leases in SDL (``leases``). Design: docs/scale-out.md."""
