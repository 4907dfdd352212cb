"""`agentstream annotate` and `agentstream calibrate` (the human layer). Handlers import lazily.

Only argument handling and output live here; reading, fitting and publishing are streams.judge's
(`human.py` for the I/O, `annotations.py` and `calibration.py` for the pure parts).

- `annotate --trajectory ID [--step N] --rubric R --score S [--annotator A] [--comment C]`, or
  `annotate --import FILE.jsonl`: publish `feedback.annotation` events to `feedback.human`.
- `calibrate [--domain D] [--publish] [--plot PATH]`: read episode starts, judge scores and
  annotations from the topics (works the same against the embedded broker and Kafka), report
  agreement per (domain, rubric), fit isotonic maps, and with `--publish` publish them as
  `calibration.updated` on `feedback.human`, where the assembler picks up the newest.
"""

from __future__ import annotations

from infra.options.env import add_option, command_parser
from infra.terminal import output


def register(sub) -> None:
    """Add this package's subcommands to the `agentstream` parser."""
    parser = command_parser(sub, "annotate", annotate, "publish human labels (feedback.human)")
    add_option(parser, "--trajectory", help="trajectory id of the label")
    add_option(parser, "--step", type=int, help="step index (leave out for a trajectory-level label)")
    add_option(parser, "--rubric", default="overall", help="rubric id the label scores")
    add_option(parser, "--score", type=float, help="human score, 0..1")
    add_option(parser, "--annotator", default="", help="who labelled")
    add_option(parser, "--comment", default="", help="free text")
    add_option(parser, "--import", dest="import_path", help="JSONL file of labels to publish instead")

    parser = command_parser(
        sub,
        "calibrate",
        calibrate,
        "fit judge->human calibration maps and report agreement",
    )
    add_option(parser, "--domain", help="only this domain")
    add_option(
        parser, "--min-pairs", type=int, default=10, help="labels needed to fit a (domain, rubric) map"
    )
    add_option(
        parser, "--publish", action="store_true", default=False, help="publish the maps (calibration.updated)"
    )
    add_option(parser, "--plot", help="write a PNG reliability plot here")
    add_option(parser, "--read-timeout", type=float, default=30.0, help="seconds to read the topics")
    add_option(
        parser,
        "--source",
        choices=("topics", "clickhouse"),
        default="topics",
        help="read scores and labels from the topics, or from ClickHouse (--clickhouse-url; faster at scale)",
    )


# --- annotate -------------------------------------------------------------------------------------


def annotate(args) -> int:
    from streams.errors import AnnotationError
    from streams.judge.annotations import annotation_event
    from streams.judge.human import publish, read_labels

    if args.import_path:
        events, rejected = read_labels(args.import_path)
    else:
        if not args.trajectory or args.score is None:
            raise AnnotationError("--trajectory and --score are required (or use --import FILE.jsonl)")
        events = [
            annotation_event(
                args.trajectory, args.rubric, args.score, args.step, args.annotator, args.comment
            )
        ]
        rejected = []
    publish(_settings(args).bootstrap_servers, events)
    output.say(f"published {len(events)} annotation(s) to feedback.human")
    output.lines(f"rejected: {line}" for line in rejected)
    return 1 if rejected else 0


# --- calibrate ------------------------------------------------------------------------------------


def calibrate(args) -> int:
    from streams.judge.annotations import pair_tables
    from streams.judge.calibration import calibration_event, fit_by_key, reliability_plot, report_rows
    from streams.judge.human import publish, read_clickhouse, read_score_tables

    settings = _settings(args)
    if args.source == "clickhouse":
        tables = read_clickhouse(settings.resolved_clickhouse_url)
    else:
        tables = read_score_tables(settings.bootstrap_servers, args.read_timeout)
    pairs = pair_tables(tables, args.domain)
    results, skipped = fit_by_key(pairs.by_key, args.min_pairs)
    _show_report(report_rows(results), skipped, pairs.unmatched)
    if args.plot and results:
        output.say(f"reliability plot: {reliability_plot(results, args.plot)}")
    if args.publish and results:
        publish(settings.bootstrap_servers, [calibration_event(r) for r in results])
        output.say(f"published {len(results)} calibration map(s) to feedback.human")
    return 0


def _show_report(rows, skipped, unmatched: int) -> None:
    from infra.terminal.tables import format_table

    output.say(format_table(rows) if rows else "no (domain, rubric) with enough labels to calibrate")
    output.lines(f"skipped {line}" for line in skipped)
    if unmatched:
        output.say(f"{unmatched} label(s) had no judge score to compare with")


def _settings(args):
    from schemas.settings import Settings

    return Settings.from_args(args)
