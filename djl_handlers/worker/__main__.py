"""``python -m djl_handlers.worker``: run one worker process (see :mod:`djl_handlers.worker.process`)."""

import sys

from djl_handlers.worker.process import main

if __name__ == "__main__":
    sys.exit(main())
