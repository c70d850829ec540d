"""Tool calls inside completions: parsing, the zoom-in's box geometry per convention, user tools, errors as text.

Every crop box below is worked out by hand on a 1000 x 500 original, which the released Qwen2.5-VL processor resizes
to 1008 x 504 (smart_resize, factor 28): a Qwen2.5-VL box is in those resized pixels, Qwen2-VL/Qwen3-VL boxes on 0-1000.
"""

from __future__ import annotations

import textwrap

import pytest
from PIL import Image, ImageDraw

from vlgrpo.data.images import DEFAULT_GEOMETRY, ProcessorGeometry
from vlgrpo.registry import TOOL
from vlgrpo.rollout.tools.calls import EXPECTED_CALL, ToolCall, ToolCallError, first_tool_call, parse_tool_calls
from vlgrpo.rollout.tools.context import ToolContext, ToolError, ToolResult
from vlgrpo.rollout.tools.table import resolve_tool, run_tool, tool_schemas
from vlgrpo.rollout.tools.zoom import ZOOM_IN, ZoomError, crop_box, zoom
from vlgrpo.types import Sample

SIZE = (1000, 500)
RED, WHITE = (255, 0, 0), (255, 255, 255)
QWEN3_GEOMETRY = ProcessorGeometry(patch_size=16)  # Qwen3-VL / Qwen3.5: 16 px patches merged 2x2, factor 32


def call(arguments: dict, name: str = "image_zoom_in_tool") -> ToolCall:
    return ToolCall(name, arguments, "", 0, 0)


def scene() -> Image.Image:
    """A white 1000 x 500 image with a red square covering pixels x 600-639, y 300-339."""
    image = Image.new("RGB", SIZE, WHITE)
    ImageDraw.Draw(image).rectangle((600, 300, 639, 339), fill=RED)
    return image


# ---------------------------------------------------------------- parsing


def test_one_call_with_text_around_it():
    body = '{"name": "image_zoom_in_tool", "arguments": {"bbox_2d": [1, 2, 3, 4], "label": "the cat"}}'
    text = f"I need a closer look.\n<tool_call>\n{body}\n</tool_call>"
    (parsed,) = parse_tool_calls(text + " trailing words")
    assert parsed.name == "image_zoom_in_tool"
    assert parsed.arguments == {"bbox_2d": [1, 2, 3, 4], "label": "the cat"}
    assert (parsed.start, parsed.end) == (22, len(text))
    assert parsed.text == text[22:] and parsed.text.startswith("<tool_call>") and parsed.text.endswith("</tool_call>")


def test_two_calls_in_order_and_the_first_is_where_a_turn_stops():
    a = '<tool_call>{"name": "zoom_in", "arguments": {"bbox_2d": [0, 0, 9, 9]}}</tool_call>'
    b = '<tool_call>{"name": "ocr"}</tool_call>'
    text = f"x{a} then {b}"
    first, second = parse_tool_calls(text)
    assert (first.name, first.start, first.end) == ("zoom_in", 1, 1 + len(a))
    assert (second.name, second.arguments, second.start) == ("ocr", {}, 1 + len(a) + 6)  # no "arguments": none
    assert first_tool_call(text) == first
    assert first_tool_call("no call here") is None
    assert parse_tool_calls('<tool_call>{"name": "ocr"}') == []  # unclosed (the stop string was cut off): no call


def test_fenced_json_is_read():
    text = '<tool_call>\n```json\n{"name": "zoom_in", "arguments": {"bbox_2d": [5, 6, 7, 8]}}\n```\n</tool_call>'
    (parsed,) = parse_tool_calls(text)
    assert isinstance(parsed, ToolCall) and parsed.arguments == {"bbox_2d": [5, 6, 7, 8]}
    assert parse_tool_calls('<tool_call>```{"name": "ocr"}```</tool_call>')[0].name == "ocr"


@pytest.mark.parametrize(
    "body, says",
    [
        ('{"name": "zoom_in", "arguments": {"bbox_2d": [1, 2, 3, 4]}', "not valid JSON (Expecting ',' delimiter"),
        ('{"arguments": {"bbox_2d": [1, 2, 3, 4]}}', 'the tool call has no "name" string'),
        ('{"name": "  ", "arguments": {}}', 'the tool call has no "name" string'),
        ('{"name": "zoom_in", "arguments": [1, 2, 3, 4]}', "\"arguments\" of the call to 'zoom_in' is a JSON array"),
        ('{"name": "zoom_in", "arguments": "{}"}', "is a JSON string, not an object"),
        ("[1, 2]", "the tool call is a JSON array, not an object"),
    ],
)
def test_malformed_calls_become_errors_the_model_can_read(body, says):
    text = f"ok <tool_call>{body}</tool_call>"
    (parsed,) = parse_tool_calls(text)
    assert isinstance(parsed, ToolCallError)
    assert says in parsed.message and parsed.message.endswith(EXPECTED_CALL)
    assert (parsed.start, parsed.end, parsed.text) == (3, len(text), text[3:])
    result = run_tool(parsed, ToolContext([scene()]))
    assert result.error == parsed.message and result.images == []


def test_a_bad_call_does_not_hide_the_next_one():
    errors, good = parse_tool_calls('<tool_call>{bad}</tool_call><tool_call>{"name": "zoom_in"}</tool_call>')
    assert isinstance(errors, ToolCallError) and isinstance(good, ToolCall) and good.start == 28


# ---------------------------------------------------------------- zoom geometry


def test_the_premise_qwen2_5_sees_the_original_at_1008_by_504():
    assert DEFAULT_GEOMETRY.resized_hw(500, 1000) == (504, 1008)


@pytest.mark.parametrize(
    "box_format, box, geometry",
    [
        ("qwen2_5", (504, 252, 756, 378), DEFAULT_GEOMETRY),  # resized px: x * 1000/1008, y * 500/504
        ("qwen2_5", (224, 112, 336, 168), ProcessorGeometry(max_pixels=128 * 28 * 28)),  # resized to 448 x 224
        ("qwen3", (500, 500, 750, 750), QWEN3_GEOMETRY),  # 0-1000 of each side
        ("qwen2", (500, 500, 750, 750), DEFAULT_GEOMETRY),
        ("plain", (500, 250, 750, 375), DEFAULT_GEOMETRY),
    ],
)
def test_each_convention_crops_the_same_region_of_the_original(box_format, box, geometry):
    assert crop_box(box, box_format, SIZE, geometry) == (500, 250, 750, 375)


def test_raw_qwen2_5_coordinates_are_not_used_as_original_pixels():
    """DeepEyes #141: the model's (504, 252, 756, 378) is not the original's (504, 252, 756, 378)."""
    assert ProcessorGeometry(max_pixels=128 * 28 * 28).resized_hw(500, 1000) == (224, 448)
    assert crop_box((504, 252, 756, 378), "qwen2_5", SIZE) != (504, 252, 756, 378)


def test_boxes_are_clamped_to_the_image_and_snapped_outwards():
    assert crop_box((-100, 900, 1200, 1100), "qwen3", SIZE) == (0, 450, 1000, 500)
    assert crop_box((100.4, 100.6, 150.2, 150.9), "plain", SIZE) == (100, 100, 151, 151)


@pytest.mark.parametrize(
    "box, box_format, says",
    [
        ((600, 100, 400, 200), "plain", "the box [600, 100, 400, 200] covers no part of the image"),
        ((600, 100, 400, 200), "plain", "in pixels of the 1000x500 image"),
        ((1100, 100, 1200, 200), "qwen3", "covers no part of the image: write [x1, y1, x2, y2] with x1 < x2"),
        ((1100, 100, 1200, 200), "qwen3", "in 0-1000 on each side"),
        ((10, 10, 10, 50), "qwen2_5", "in pixels of the 1008x504 image"),  # the frame the model sees
        ((0, 0, 1000, 5), "plain", "the box [0, 0, 1000, 5] is 200 times longer than it is wide (at most 100"),
    ],
)
def test_degenerate_boxes_are_refused_with_a_message(box, box_format, says):
    with pytest.raises(ZoomError) as e:
        crop_box(box, box_format, SIZE)
    assert says in str(e.value)


def test_aspect_ratio_of_exactly_100_is_accepted_then_grown():
    assert crop_box((0, 0, 500, 5), "plain", SIZE) == (0, 0, 500, 28)


@pytest.mark.parametrize(
    "box, geometry, expected",
    [
        ((100, 100, 110, 110), DEFAULT_GEOMETRY, (91, 91, 119, 119)),  # 10 px -> 28 around the centre 105
        ((100, 100, 110, 110), QWEN3_GEOMETRY, (89, 89, 121, 121)),  # -> 32 for Qwen3-VL
        ((100, 100, 111, 111), DEFAULT_GEOMETRY, (92, 92, 120, 120)),  # odd growth: 8 before, 9 after
        ((100, 100, 110, 300), DEFAULT_GEOMETRY, (91, 100, 119, 300)),  # only the short side grows
        ((0, 0, 10, 10), DEFAULT_GEOMETRY, (0, 0, 28, 28)),  # shifted right/down to stay inside
        ((995, 495, 1000, 500), DEFAULT_GEOMETRY, (972, 472, 1000, 500)),  # shifted left/up
    ],
)
def test_small_boxes_grow_to_one_image_token(box, geometry, expected):
    assert crop_box(box, "plain", SIZE, geometry) == expected


def test_growth_stops_at_the_image_side():
    assert crop_box((5, 100, 10, 200), "plain", (20, 500)) == (0, 100, 20, 200)


def test_the_crop_holds_the_pixels_the_box_names():
    # the red square in Qwen2.5-VL's resized pixels: x * 1008/1000, y * 504/500
    crop = zoom(scene(), (604.8, 302.4, 645.12, 342.72), "qwen2_5")
    assert crop.size == (40, 40) and crop.getcolors() == [(1600, RED)]
    # a margin of 10 px around it, in Qwen3-VL's 0-1000: the square sits at 10..49 of the 60 x 60 crop
    crop = zoom(scene(), (590, 580, 650, 700), "qwen3", QWEN3_GEOMETRY)
    assert crop.size == (60, 60)
    assert [crop.getpixel(p) for p in [(9, 9), (10, 10), (49, 49), (50, 50)]] == [WHITE, RED, RED, WHITE]


# ---------------------------------------------------------------- running calls


def test_zoom_tool_returns_the_crop_under_both_names():
    context = ToolContext([scene()], box_format="qwen3", geometry=QWEN3_GEOMETRY)
    for name in ("image_zoom_in_tool", "zoom_in"):
        result = run_tool(call({"bbox_2d": [600, 600, 640, 680], "label": "red square"}, name), context)
        assert result.error is None and result.text is None
        assert result.images[0].size == (40, 40) and result.images[0].getcolors() == [(1600, RED)]


def test_image_index_crops_an_image_a_tool_returned():
    earlier = Image.new("RGB", (100, 100), WHITE)
    ImageDraw.Draw(earlier).rectangle((50, 0, 99, 99), fill=RED)  # right half red
    context = ToolContext([scene(), earlier], box_format="plain")
    right = run_tool(call({"bbox_2d": [50, 0, 100, 100], "image_index": 1}), context).images[0]
    assert right.size == (50, 100) and right.getcolors() == [(5000, RED)]
    assert run_tool(call({"bbox_2d": [50, 0, 100, 100]}), context).images[0].getcolors() == [(5000, WHITE)]


@pytest.mark.parametrize(
    "arguments, says",
    [
        ({"bbox_2d": [1, 2, 3]}, 'image_zoom_in_tool: "bbox_2d" must be a list of 4 numbers [x1, y1, x2, y2], got [1'),
        ({"bbox": [1, 2, 3, 4]}, '"bbox_2d" must be a list of 4 numbers [x1, y1, x2, y2], got null'),
        ({"bbox_2d": [1, 2, "3", 4]}, 'got [1, 2, "3", 4]'),
        ({"bbox_2d": [True, 2, 3, 4]}, "must be a list of 4 numbers"),
        (
            {"bbox_2d": [1, 2, 3, 4], "image_index": 2},
            '"image_index" must be an integer from 0 to 0 (0 is the original',
        ),
        ({"bbox_2d": [600, 100, 400, 200]}, "image_zoom_in_tool: the box [600, 100, 400, 200] covers no part"),
    ],
)
def test_bad_zoom_arguments_come_back_as_errors(arguments, says):
    result = run_tool(call(arguments), ToolContext([scene()], box_format="plain"))
    assert result.images == [] and says in result.error


def test_an_unknown_tool_names_the_tools_there_are():
    result = run_tool(call({}, "crop"), ToolContext([scene()]))
    assert result.error == "there is no tool 'crop'; the tools are: image_zoom_in_tool"


USER_TOOLS = '''
from PIL import Image

def describe(arguments, context):
    """Say how many images the trajectory holds.

    Longer notes the model does not read.
    """
    return f"{len(context.images)} images, first {context.original_size}, asked {arguments['what']}"

describe.SCHEMA = {"type": "object", "properties": {"what": {"type": "string"}}, "required": ["what"]}
describe.GOLD = lambda sample, context: {"what": sample.id} if sample.answer else None

def flip(arguments, context):
    """Mirror the original image left to right."""
    return [context.images[0].transpose(Image.Transpose.FLIP_LEFT_RIGHT), "mirrored"]

def boom(arguments, context):
    """Always fails."""
    raise RuntimeError("disk on fire")

def refuse(arguments, context):
    """Refuses its arguments."""
    raise ValueError("'n' must be positive")

def wrong(arguments, context):
    """Returns a number."""
    return 3

def undocumented(arguments, context):
    return "x"

def zoom_in(arguments, context):
    """Clashes with the built-in's alias."""
'''


@pytest.fixture
def user_file(tmp_path):
    path = tmp_path / "my_tools.py"
    path.write_text(textwrap.dedent(USER_TOOLS))
    return str(path)


def test_user_tools_from_a_file_return_text_and_images(user_file):
    tools = ("zoom_in", f"{user_file}:describe", f"{user_file}:flip")
    context = ToolContext([scene()])
    text = run_tool(call({"what": "why"}, "describe"), context, tools)
    assert text == ToolResult("1 images, first (1000, 500), asked why", [])
    flipped = run_tool(call({}, "flip"), context, tools)
    assert flipped.text == "mirrored" and flipped.error is None
    assert flipped.images[0].getpixel((1000 - 1 - 600, 300)) == RED and flipped.images[0].getpixel((600, 300)) == WHITE


def test_user_tool_failures_come_back_as_errors(user_file):
    tools = [f"{user_file}:{name}" for name in ("boom", "refuse", "wrong")]
    context = ToolContext([scene()])
    assert run_tool(call({}, "boom"), context, tools).error == "tool 'boom' failed: RuntimeError: disk on fire"
    assert run_tool(call({}, "refuse"), context, tools).error == "refuse: 'n' must be positive"
    assert run_tool(call({}, "wrong"), context, tools).error.startswith("tool 'wrong' returned int; a tool returns str")


def test_schemas_of_built_in_and_user_tools(user_file):
    zoom_schema, user_schema = tool_schemas(["zoom_in", f"{user_file}:describe"])
    assert zoom_schema["type"] == "function" and zoom_schema["function"]["name"] == "image_zoom_in_tool"
    assert zoom_schema["function"]["parameters"]["required"] == ["bbox_2d"]
    assert set(zoom_schema["function"]["parameters"]["properties"]) == {"bbox_2d", "label", "image_index"}
    assert user_schema == {
        "type": "function",
        "function": {
            "name": "describe",
            "description": "Say how many images the trajectory holds.",
            "parameters": {"type": "object", "properties": {"what": {"type": "string"}}, "required": ["what"]},
        },
    }
    assert tool_schemas([f"{user_file}:flip"])[0]["function"]["parameters"] == {"type": "object", "properties": {}}
    assert len(tool_schemas(["zoom_in", "zoom_in"])) == 1


def test_a_bad_tool_list_is_a_config_error(user_file, tmp_path):
    with pytest.raises(ToolError, match="unknown tool 'zoom'; accepted: zoom_in, or a user function as module:fu"):
        resolve_tool("zoom")
    with pytest.raises(ToolError, match="tool 'no_such_module_xyz:f': cannot load 'no_such_module_xyz'"):
        resolve_tool("no_such_module_xyz:f")
    with pytest.raises(ToolError, match=r"my_tools.py' has no function 'nope'"):
        resolve_tool(f"{user_file}:nope")
    with pytest.raises(ToolError, match="has no docstring: its first paragraph is the description"):
        resolve_tool(f"{user_file}:undocumented")
    with pytest.raises(ToolError, match="are called 'zoom_in'"):
        tool_schemas(["zoom_in", f"{user_file}:zoom_in"])
    with pytest.raises(ValueError, match="box format 'auto' is not accepted; use one of: qwen2, qwen2_5"):
        ToolContext([scene()], box_format="auto")


def test_the_built_in_tools_are_the_registrys():
    assert resolve_tool("zoom_in") is TOOL.load("zoom_in") is ZOOM_IN
    assert TOOL.names == ("zoom_in",)


@pytest.mark.parametrize(
    "box_format, want",
    [
        ("plain", [558, 258, 682, 382]),  # 600-640 x 300-340 grown to 125 px (a quarter of 500) about its centre
        ("qwen3", [558, 515, 682, 765]),  # the same region on 0-1000: y / 500 * 1000
    ],
)
def test_the_zoom_tools_gold_call_is_the_samples_box_grown(box_format, want):
    sample = Sample("s", "What is red?", "square", "text", boxes=[[600, 300, 640, 340]])
    context = ToolContext([scene()], box_format)
    assert ZOOM_IN.gold_call(sample, context) == {"bbox_2d": want}
    assert ZOOM_IN.gold_call(Sample("t", "What is red?", "square", "text"), context) is None  # no box, no call


def test_a_user_tool_offers_gold_calls_by_its_gold_attribute(user_file):
    context = ToolContext([scene()])
    describe, flip = resolve_tool(f"{user_file}:describe"), resolve_tool(f"{user_file}:flip")
    assert describe.gold_call(Sample("s", "Why?", "because", "text"), context) == {"what": "s"}
    assert describe.gold_call(Sample("s", "Why?", "", "text"), context) is None
    assert flip.gold is None and flip.gold_call(Sample("s", "Why?", "because", "text"), context) is None
