from __future__ import annotations

import json

import click

from speechctl.cli.options import quiet_libraries, user_errors


@click.command("bench")
@click.option("--cfg", "cfg", is_flag=True, required=True, help="CFG vs no-CFG throughput (the benchmark available now).")
@click.option("--shape", type=click.Choice(["tiny", "llama-1b", "higgs-3b"]), default="tiny", show_default=True, help="Model shape (random weights).")
@click.option("--concurrency", default="1,4", show_default=True, help="Comma-separated concurrencies (requests, or pairs with CFG).")
@click.option("--frames", type=click.IntRange(1), default=64, show_default=True, help="Audio frames per request (fixed).")
@click.option("--repeats", type=click.IntRange(1), default=3, show_default=True)
@click.option("--scale", type=float, default=3.0, show_default=True, help="CFG scale.")
@click.option("--out", "out", type=click.Path(dir_okay=False), help="Write the result as JSON here.")
@click.option("--plot", type=click.Path(dir_okay=False), help="Write a PNG plot here (needs matplotlib).")
@click.option("--verbose", "-v", is_flag=True)
@user_errors
def command(cfg, shape, concurrency, frames, repeats, scale, out, plot, verbose):
    """Measure throughput side by side in one run and print the ratios."""
    from speechctl.audio import write_json_atomic
    from speechctl.bench.cfg import plot_cfg, run_cfg_bench

    quiet_libraries(verbose)
    levels = [int(x) for x in concurrency.split(",") if x.strip()]
    result = run_cfg_bench(shape, levels, frames, repeats, scale, log=lambda line: click.echo(line, err=True))
    if out:
        write_json_atomic(out, result)
    if plot:
        plot_cfg(result, plot)
    click.echo(json.dumps(result["results"], indent=2))
