from shipper.commands.main import main

raise SystemExit(main())
