"""Rolling and dynamic batches over an engine: DJL's slot protocol, stopping criteria, incremental detokenizing."""
