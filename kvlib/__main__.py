import sys

from kvlib.cli import main

sys.exit(main())
