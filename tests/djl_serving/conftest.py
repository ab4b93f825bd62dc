"""Keep pytest out of the fetched jars' Python sources and the test model directories."""

collect_ignore = ["lib", "models"]
