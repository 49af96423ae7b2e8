from rocmforge.cli import main

raise SystemExit(main())
