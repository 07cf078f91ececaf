"""Run the pmemwal command from a checkout: python cli.py bench --help."""
from pmemwal.tools.cli import main

if __name__ == "__main__":
    main()
