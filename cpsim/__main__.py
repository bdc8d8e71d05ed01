from cpsim.cli import main

raise SystemExit(main())
