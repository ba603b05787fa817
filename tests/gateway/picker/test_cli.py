"""``kvgate picker``'s flags that reach its settings: the prefill step's bound."""

from __future__ import annotations

import pytest

from kvgate.extproc.prefill_client import DEFAULT_TIMEOUT_S
from kvgate.gateway.picker.cli import build_parser, settings_from_args


def test_the_prefill_timeout_reaches_the_settings_and_defaults_below_envoys_message_timeout() -> None:
    parser = build_parser()
    assert settings_from_args(parser.parse_args([]), None).prefill_timeout == DEFAULT_TIMEOUT_S < 30.0
    args = parser.parse_args(["--prefill-timeout", "7.5"])
    assert settings_from_args(args, None).prefill_timeout == 7.5


@pytest.mark.parametrize("value", ["0", "-1", "soon", "nan"])
def test_a_prefill_timeout_that_is_not_a_positive_number_is_refused(
    value: str, capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--prefill-timeout", value])
    assert "--prefill-timeout" in capsys.readouterr().err
