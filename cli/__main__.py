from agent_blackbox.cli.main import main

main()
