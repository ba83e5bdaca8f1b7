from slurm_hooks.cli import main

main()
