"""KServe v1 / v2 request cases shared by the unit, in-process and end-to-end tests (one table, three layers).

Each malformed case: (name, JSON body, expected status, expected type, text the message must contain).
"""

from __future__ import annotations

from typing import Any

MALFORMED: list[tuple[str, Any, int, str, str]] = [
    ("v1 instances not a list", {"instances": "a text"}, 400, "MalformedRequest", "'instances' must be an array"),
    ("v1 empty instances", {"instances": []}, 400, "MalformedRequest", "'instances' is empty"),
    ("v1 instance of wrong type", {"instances": ["fine", 7]}, 400, "WrongType", "instances[1]"),
    ("v1 instance object without text", {"instances": [{"txt": "x"}]}, 400, "MissingField", "instances[0]"),
    ("v1 empty instance", {"instances": ["good one", "", "another"]}, 400, "EmptyText", "instances[1]"),
    ("v2 inputs not a list", {"inputs": {"name": "text"}}, 400, "MalformedRequest", "non-empty array"),
    ("v2 no inputs", {"inputs": []}, 400, "MalformedRequest", "non-empty array"),
    ("Hugging Face style inputs", {"inputs": "a text"}, 400, "MalformedRequest", '{"text": "..."} on /predictions'),
    ("inputs a list of texts", {"inputs": ["a", "b"]}, 400, "MalformedRequest", '{"instances": ["..."]}'),
    ("v1 text_pair of wrong type", {"instances": [{"text": "a", "text_pair": 3}]}, 400, "WrongType", "'text_pair'"),
    ("v1 empty text_pair", {"instances": ["ok", {"text": "a", "text_pair": ""}]}, 400, "EmptyText", "[1]: text_pair"),
    (
        "v2 two inputs not named text and text_pair",
        {"inputs": [v2_input := {"name": "text", "shape": [1], "datatype": "BYTES", "data": ["a"]}, v2_input]},
        400,
        "MalformedRequest",
        "must be named 'text' and 'text_pair'",
    ),
    ("v2 three inputs", {"inputs": [v2_input] * 3}, 400, "MalformedRequest", "expected one input tensor"),
    (  # a pair's second text alone, its `text` input dropped: read as the text, it would be answered wrongly
        "v2 text_pair without text",
        {"inputs": [{**v2_input, "name": "text_pair"}]},
        400,
        "MalformedRequest",
        "an input named 'text_pair' is the second text of a pair: send the first as an input named 'text' beside it",
    ),
    (
        "v2 two inputs, one name not a string",
        {"inputs": [v2_input, {**v2_input, "name": ["text_pair"]}]},
        400,
        "MalformedRequest",
        "must be named 'text' and 'text_pair'",
    ),
    (
        "v2 pair columns of different lengths",
        {"inputs": [v2_input, {"name": "text_pair", "shape": [2], "datatype": "BYTES", "data": ["b", "c"]}]},
        400,
        "MalformedRequest",
        "'text' has 1 texts and 'text_pair' 2",
    ),
    (
        "v2 text_pair of wrong datatype",
        {"inputs": [v2_input, {"name": "text_pair", "shape": [1], "datatype": "INT64", "data": [1]}]},
        400,
        "MalformedRequest",
        "inputs[1].datatype",
    ),
    (
        "v2 whitespace-only text_pair",
        {
            "inputs": [
                {"name": "text_pair", "shape": [2], "datatype": "BYTES", "data": ["fine", " "]},
                {"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", "b"]},
            ]
        },
        400,
        "EmptyText",
        "inputs[1].data[1]: text_pair",  # named by the input called "text", second here
    ),
    (
        "v2 wrong datatype",
        {"inputs": [{"name": "text", "shape": [1], "datatype": "FP32", "data": [1.0]}]},
        400,
        "MalformedRequest",
        "BYTES",
    ),
    (
        "v2 shape not matching data",
        {"inputs": [{"name": "text", "shape": [3], "datatype": "BYTES", "data": ["a", "b"]}]},
        400,
        "MalformedRequest",
        "does not match",
    ),
    (
        "v2 non-string data",
        {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", 5]}]},
        400,
        "MalformedRequest",
        "inputs[0].data[1] must be a string",
    ),
    (
        "v2 missing data",
        {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES"}]},
        400,
        "MalformedRequest",
        "'data'",
    ),
    (
        "v2 whitespace-only text",
        {"id": "r1", "inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["ok", "  "]}]},
        400,
        "EmptyText",
        "inputs[0].data[1]",
    ),
    (
        "v2 id not a string",
        {"id": 7, **(v2_one := {"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["ok"]}]})},
        400,
        "MalformedRequest",
        "'id' must be a string, got number",
    ),
    (  # valid JSON ("\ud800" escaped), but no UTF-8 can hold it: echoed, it killed the worker and its batch
        "v2 id a lone surrogate",
        {"id": "\ud800", "inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["ok"]}]},
        400,
        "MalformedRequest",
        "'id' is not valid Unicode",
    ),
    (
        "v2 nested data not matching its shape",
        {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": [["a"], ["b"]]}]},
        400,
        "MalformedRequest",
        "inputs[0].data nested does not match shape [2]",
    ),
    (
        "v2 an output the model does not have",
        {**v2_one, "outputs": [{"name": "label"}, {"name": "logits"}]},
        400,
        "MalformedRequest",
        "outputs[1].name must be one of label, score, probabilities, truncated, got 'logits'",
    ),
    (
        "v2 outputs not an array",
        {**v2_one, "outputs": {"name": "label"}},
        400,
        "MalformedRequest",
        "'outputs' must be an array of {\"name\": ...}, got object",
    ),
    (
        "v2 an output named by a bare string",
        {**v2_one, "outputs": ["label"]},
        400,
        "MalformedRequest",
        "outputs[0] must be an object with a 'name', got string",
    ),
    # The binary data extension's flags are booleans: any other value is refused, not guessed either way.
    (
        "v2 binary_data not a boolean",
        {**v2_one, "outputs": [{"name": "label", "parameters": {"binary_data": "true"}}]},
        400,
        "MalformedRequest",
        "outputs[0].parameters.binary_data must be a boolean, got string",
    ),
    (
        "v2 binary_data_output not a boolean",
        {**v2_one, "parameters": {"binary_data_output": 1}},
        400,
        "MalformedRequest",
        "parameters.binary_data_output must be a boolean, got number",
    ),
    # The classification extension (tritonclient's class_count): top-k strings in place of the tensor, not served.
    (
        "v2 classification asked for",
        {**v2_one, "outputs": [{"name": "probabilities", "parameters": {"classification": 2}}]},
        400,
        "MalformedRequest",
        "outputs[0].parameters.classification is not supported",
    ),
    (
        "v2 parameters not an object",
        {**v2_one, "parameters": []},
        400,
        "MalformedRequest",
        "parameters must be an object",
    ),
    # 64 instances per request is the default max_instances handler option.
    ("v1 too many instances", {"instances": ["x"] * 65}, 413, "TooManyInstances", "limit is 64"),
    (
        "v2 too many instances",
        {"inputs": [{"name": "text", "shape": [65], "datatype": "BYTES", "data": ["x"] * 65}]},
        413,
        "TooManyInstances",
        "limit is 64",
    ),
]


def v1(*texts: str) -> dict[str, Any]:
    return {"instances": list(texts)}


def v2(*texts: str, request_id: str | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "text", "shape": [len(texts)], "datatype": "BYTES", "data": list(texts)}]
    }
    if request_id is not None:
        body["id"] = request_id
    return body
