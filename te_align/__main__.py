import sys

from te_align.cli import main

sys.exit(main())
