from orchestrator.endpoint import main

main()
