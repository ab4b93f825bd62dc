"""The TGI dialect: ``/generate`` bodies as LMI bodies (:mod:`.request`), TGI's answers (:mod:`.response`)."""
