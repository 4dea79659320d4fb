from __future__ import annotations

import click

from speechctl.cli.options import user_errors


@click.command("models")
@click.argument("name", required=False, metavar="[NAME|DIR|ORG/NAME]")
@user_errors
def command(name):
    """List the built-in models, or describe one (a name, a checkpoint directory or a hub id):
    what speechctl will use from it and what is missing."""
    from rich.console import Console
    from rich.table import Table

    from speechctl.models.catalog import describe_model, list_models

    console = Console()
    if name is None:
        table = Table("name", "description", box=None)
        for model in list_models():
            table.add_row(model["name"], model["description"])
        console.print(table)
        console.print("Any checkpoint directory or Hugging Face hub id works too: --model path/to/checkpoint, --model ORG/NAME")
        return
    table = Table(box=None, show_header=False)
    for key, value in describe_model(name).items():
        table.add_row(key, str(value))
    console.print(table)
