"""The Bedrock-style ("3p") dialect: its bodies as LMI bodies (:mod:`.request`), its answers (:mod:`.response`)."""
