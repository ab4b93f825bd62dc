"""Keep pytest out of the fetched jars' Python sources (every release's folder) and the test model directories."""

collect_ignore = ["lib", "models"]
collect_ignore_glob = ["lib[.-]*"]
