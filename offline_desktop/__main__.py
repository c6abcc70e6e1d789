"""``python -m offline_desktop [PROJECT]``: open a project's desktop app (see `offline_desktop.project`)."""

import sys

from .project import main

sys.exit(main())
