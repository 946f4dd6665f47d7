import sys

from localspec.cli import main

sys.exit(main())
