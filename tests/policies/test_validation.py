"""``policies.validation``: pydantic's errors in one readable line."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field, ValidationError, field_validator

from kvgate.policies.validation import describe


class Item(BaseModel):
    port: int

    @field_validator("port")
    @classmethod
    def _port(cls, value: int) -> int:
        if not 0 < value < 65536:
            raise ValueError(f"port must be 1-65535, not {value}")
        return value


class File(BaseModel):
    items: tuple[Item, ...] = Field(min_length=1)


def error_of(data: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        File.model_validate(data)
    return caught.value


def test_each_error_is_where_and_what_on_one_line() -> None:
    text = describe(error_of({"items": [{"port": 99999}, {"port": "x"}]}))
    assert "\n" not in text
    assert "https://" not in text
    assert text.startswith("items.0.port: port must be 1-65535, not 99999; items.1.port: ")


def test_a_list_too_short_because_its_items_failed_is_not_said() -> None:
    assert "at least 1 item" not in describe(error_of({"items": [{"port": 0}]}))
    assert describe(error_of({"items": []})).startswith("items: ")  # really empty: said
    assert describe(error_of({"items": 5})) == "items: Input should be a list"


def test_a_mapping_that_is_not_one_is_said_so() -> None:
    assert describe(error_of([1, 2])) == "Input should be a mapping"
    assert describe(error_of({"items": [5]})) == "items.0: Input should be a mapping"
