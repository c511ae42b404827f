"""``python -m ctxwarden`` runs the CLI."""

from ctxwarden.cli import main

main()
