import sys

from localspec.launch import main

sys.exit(main())
