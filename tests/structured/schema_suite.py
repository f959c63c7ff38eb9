"""The 30-schema suite: JSON Schemas of varied shape, each with a prompt that asks for it, that every structured
output of SmolLM2 (with and without the demo adapters, greedy and sampled) must validate against.

Shapes: flat and nested objects, arrays with minItems/maxItems (of scalars, objects, arrays, a tuple), enums and
const, anyOf and an exclusive oneOf, string formats (date, email, uuid, date-time), patterns, integer and number
bounds (exclusive ones, multipleOf), required/optional mixes, nullable fields, $defs/$ref. Every string is bounded
(maxLength, enum, format or pattern) and every array has maxItems, so a 135M model reaches the end of each document
within max_tokens; keywords llguidance refuses (uniqueItems, not, if/then, ...) are tested apart, in
test_compile_limits.py, and stay out of this list.
"""

from datetime import datetime

import jsonschema

NAME = {"type": "string", "minLength": 1, "maxLength": 24}
WORD = {"type": "string", "minLength": 1, "maxLength": 12}


def closed(properties: dict, required: list[str] | None = None) -> dict:
    """An object with no other properties; every one required unless ``required`` names fewer."""
    return {"type": "object", "properties": properties,
            "required": list(properties) if required is None else required, "additionalProperties": False}


def bounded_array(items: dict, low: int, high: int) -> dict:
    return {"type": "array", "items": items, "minItems": low, "maxItems": high}


LINE = closed({"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
               "quantity": {"type": "integer", "minimum": 1, "maximum": 99}})
POINT = closed({"lat": {"type": "number", "minimum": -90, "maximum": 90},
                "lon": {"type": "number", "minimum": -180, "maximum": 180}})

SUITE: list[tuple[str, str, dict]] = [
    ("person", "Give the name and age of a fictional person.",
     closed({"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 120}})),
    ("address", "Give a fictional customer with a postal address.",
     closed({"name": NAME, "address": closed({"street": NAME, "city": WORD,
                                              "zip": {"type": "string", "pattern": "^[0-9]{5}$"}})})),
    ("tags", "List one to four tags for a blog post about baking bread.", closed({"tags": bounded_array(WORD, 1, 4)})),
    ("color", "What color is a ripe banana?", closed({"color": {"enum": ["red", "yellow", "green", "blue"]}})),
    ("score_or_unknown", "Rate the film Casablanca from 0 to 100, or say it is unknown.",
     closed({"score": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 100}, {"enum": ["unknown"]}]}})),
    ("id_one_of", "Give an identifier for a library book: a number or a short code.",
     closed({"id": {"oneOf": [{"type": "integer", "minimum": 1, "maximum": 99999},
                              {"type": "string", "maxLength": 10}]}})),
    ("birthday", "When was a fictional person born? Give the date.",
     closed({"name": NAME, "born": {"type": "string", "format": "date"}})),
    ("contact_email", "Give a contact email address for a fictional bakery.",
     closed({"email": {"type": "string", "format": "email", "maxLength": 40}})),
    ("order_uuid", "Give a new order with a UUID.",
     closed({"order_id": {"type": "string", "format": "uuid"}, "paid": {"type": "boolean"}})),
    ("meeting", "Schedule a meeting: a title and a start time.",
     closed({"title": NAME, "starts_at": {"type": "string", "format": "date-time"}})),
    ("phone", "Give a phone number for a fictional office.",
     closed({"phone": {"type": "string", "pattern": "^\\+[0-9]{2}-[0-9]{3}-[0-9]{4}$"}})),
    ("exclusive_bounds", "Pick a whole number strictly between 10 and 20, and one strictly below 0.",
     closed({"inside": {"type": "integer", "exclusiveMinimum": 10, "exclusiveMaximum": 20},
             "negative": {"type": "integer", "exclusiveMaximum": 0, "minimum": -1000}})),
    ("weather", "Report today's weather in Oslo.",
     closed({"city": WORD, "temperature_c": {"type": "number", "minimum": -60, "maximum": 60},
             "condition": {"enum": ["sunny", "cloudy", "rain", "snow", "fog"]}})),
    ("report_const", "Write a version 2 report header.",
     closed({"kind": {"const": "report"}, "version": {"const": 2}, "title": NAME})),
    ("optional_fields", "Describe a user; the nickname and the age are optional.",
     closed({"username": WORD, "nickname": WORD, "age": {"type": "integer", "minimum": 13, "maximum": 110}},
            required=["username"])),
    ("shopping_list_ref", "Write a short shopping list with quantities.",
     {"$defs": {"item": closed({"name": WORD, "count": {"type": "integer", "minimum": 1, "maximum": 12}})},
      **closed({"items": bounded_array({"$ref": "#/$defs/item"}, 1, 3)})}),
    ("animal_flags", "Say whether a cat is a mammal, can fly and lays eggs.",
     closed({"mammal": {"type": "boolean"}, "flies": {"type": "boolean"}, "lays_eggs": {"type": "boolean"}})),
    ("team", "List two or three members of a fictional team with their roles.",
     closed({"team": NAME, "members": bounded_array(closed({"name": NAME, "role": {"enum": [
         "lead", "engineer", "designer"]}}), 2, 3)})),
    ("matrix", "Give a 2 by 2 matrix of small integers.",
     closed({"rows": bounded_array(bounded_array({"type": "integer", "minimum": -9, "maximum": 9}, 2, 2), 2, 2)})),
    ("http_status", "Which HTTP status code means 'not found'?", closed({"code": {"enum": [200, 301, 404, 500]}})),
    ("nullable_middle_name", "Give a person's first name and middle name (null if none).",
     closed({"first": NAME, "middle": {"anyOf": [NAME, {"type": "null"}]}})),
    ("shape_any_of", "Describe a geometric shape: a circle or a rectangle.",
     closed({"shape": {"anyOf": [closed({"kind": {"const": "circle"}, "radius": {"type": "integer", "minimum": 1,
                                                                                 "maximum": 100}}),
                                 closed({"kind": {"const": "rectangle"},
                                         "width": {"type": "integer", "minimum": 1, "maximum": 100},
                                         "height": {"type": "integer", "minimum": 1, "maximum": 100}})]}})),
    ("username_lengths", "Suggest a username of 3 to 10 letters and a display name.",
     closed({"username": {"type": "string", "pattern": "^[a-z]{3,10}$"}, "display": NAME})),
    ("weekdays", "On which one to three weekdays is the gym busiest?",
     closed({"days": bounded_array({"enum": ["mon", "tue", "wed", "thu", "fri", "sat", "sun"]}, 1, 3)})),
    ("multiple_of", "Pick a price in whole euros that is a multiple of 5, below 100.",
     closed({"price_eur": {"type": "integer", "minimum": 0, "maximum": 95, "multipleOf": 5}})),
    ("tuple", "Give a word and its number of letters as a pair.",
     closed({"pair": {"type": "array", "prefixItems": [WORD, {"type": "integer", "minimum": 1, "maximum": 20}],
                      "items": False, "minItems": 2, "maxItems": 2}})),
    ("product", "Describe a product in a web shop.",
     closed({"sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"}, "name": NAME,
             "price": {"type": "number", "minimum": 0, "maximum": 1000}, "in_stock": {"type": "boolean"},
             "category": {"enum": ["books", "garden", "toys", "tools"]},
             "rating": {"type": "integer", "minimum": 1, "maximum": 5}},
            required=["sku", "name", "price", "in_stock"])),
    ("event", "Describe a concert: when, where (coordinates) and its genre.",
     closed({"name": NAME, "when": {"type": "string", "format": "date-time"}, "where": POINT,
             "genre": {"enum": ["jazz", "rock", "classical"]}})),
    ("invoice_ref", "Write a small invoice with one or two lines.",
     {"$defs": {"line": LINE},
      **closed({"number": {"type": "string", "pattern": "^INV-[0-9]{4}$"}, "issued": {"type": "string",
                                                                                      "format": "date"},
                "lines": bounded_array({"$ref": "#/$defs/line"}, 1, 2)})}),
    ("sentiment", "Classify the sentiment of: 'I loved this film, the ending was perfect.'",
     closed({"label": {"enum": ["positive", "negative", "neutral"]},
             "confidence": {"type": "number", "minimum": 0, "maximum": 1}})),
]


def _is_rfc3339_date_time(value: str) -> bool:
    # jsonschema checks date-time only with the rfc3339-validator package installed; the offset is required
    return datetime.fromisoformat(value).tzinfo is not None


FORMAT_CHECKER = jsonschema.FormatChecker()
FORMAT_CHECKER.checks("date-time", raises=ValueError)(_is_rfc3339_date_time)


def validate(instance, schema: dict) -> None:
    """Raise jsonschema.ValidationError unless ``instance`` is valid, formats included."""
    jsonschema.validate(instance, schema, format_checker=FORMAT_CHECKER)
