"""Patches as regions (`hf_vlalign.alignment.patches`): the cell grid, the coverage of a cell by gold boxes, the
supervision target over covered cells, the centre prior, and how `ImageGeometry` carries pixel boxes of the original
image into the processed image of CLIP (resize + centre crop), SigLIP (fixed resize) and ViLT (resize + padding)
image processors, checked against the processors themselves on drawn rectangles."""

import pytest
import torch
from PIL import Image, ImageDraw
from transformers import (
    CLIPImageProcessorPil,
    SiglipImageProcessorPil,
    ViltImageProcessorPil,
)

from hf_vlalign.alignment.patches import (
    DEFAULT_COVERAGE_THRESHOLD,
    ImageGeometry,
    cell_boxes,
    cell_coverage,
    centre_prior,
    covered_cells_target,
)

# ----------------------------------------------------------------------------------------------------------- grid


def test_cell_boxes_are_row_major_and_normalised():
    boxes = cell_boxes((2, 3))
    third = 1 / 3
    expected = torch.tensor(
        [
            [0, 0, third, 0.5], [third, 0, 2 * third, 0.5], [2 * third, 0, 1, 0.5],
            [0, 0.5, third, 1], [third, 0.5, 2 * third, 1], [2 * third, 0.5, 1, 1],
        ]
    )  # fmt: skip
    assert boxes.shape == (6, 4)
    torch.testing.assert_close(boxes, expected)
    # index = row * columns + column
    rows, columns = 3, 5
    boxes = cell_boxes((rows, columns))
    for index in (0, 4, 7, 14):
        row, column = divmod(index, columns)
        torch.testing.assert_close(
            boxes[index], torch.tensor([column / columns, row / rows, (column + 1) / columns, (row + 1) / rows])
        )


@pytest.mark.parametrize("grid", [(0, 3), (2, -1), (2.0, 3), (True, 2), (2,), (1, 2, 3), "22"])
def test_bad_grid_names_grid(grid):
    with pytest.raises(ValueError, match="`grid`"):
        cell_boxes(grid)
    with pytest.raises(ValueError, match="`grid`"):
        cell_coverage(torch.tensor([[0.0, 0.0, 0.5, 0.5]]), grid)


# ------------------------------------------------------------------------------------------------------- coverage


def test_coverage_of_a_box_on_one_cell_and_of_quarter_overlaps():
    grid = (2, 2)
    exact = cell_coverage(torch.tensor([[0.5, 0.0, 1.0, 0.5]]), grid)
    torch.testing.assert_close(exact, torch.tensor([0.0, 1.0, 0.0, 0.0]))
    # a box centred on the grid's middle covers a quarter of every cell
    centred = cell_coverage(torch.tensor([[0.25, 0.25, 0.75, 0.75]]), grid)
    torch.testing.assert_close(centred, torch.full((4,), 0.25))
    # a box larger than the image still gives a share of at most 1
    whole = cell_coverage(torch.tensor([[0.0, 0.0, 1.0, 1.0]]), (3, 4))
    torch.testing.assert_close(whole, torch.ones(12))
    # 4 x 4 grid, box over the top-left 1.5 x 1 cells: cell 0 fully, cell 1 half, nothing else
    partial = cell_coverage(torch.tensor([[0.0, 0.0, 0.375, 0.25]]), (4, 4))
    expected = torch.zeros(16)
    expected[0], expected[1] = 1.0, 0.5
    torch.testing.assert_close(partial, expected)


def test_coverage_is_the_largest_share_over_the_boxes_and_keeps_leading_dims():
    boxes = torch.tensor(
        [
            [[0.0, 0.0, 0.5, 0.5], [0.25, 0.25, 0.75, 0.75]],  # cell 0 whole, every cell a quarter
            [[0.5, 0.5, 1.0, 1.0], [0.5, 0.5, 0.75, 0.75]],  # the second box lies inside the first
        ]
    )
    coverage = cell_coverage(boxes, (2, 2))
    assert coverage.shape == (2, 4)
    torch.testing.assert_close(coverage, torch.tensor([[1.0, 0.25, 0.25, 0.25], [0.0, 0.0, 0.0, 1.0]]))
    # no box at all: zero coverage everywhere
    torch.testing.assert_close(cell_coverage(torch.zeros(3, 0, 4), (2, 2)), torch.zeros(3, 4))


@pytest.mark.parametrize(
    "boxes",
    [torch.tensor([[0.0, 0.0, 1.5, 0.5]]), torch.tensor([[-0.1, 0.0, 0.5, 0.5]]), torch.tensor([[0.0, 0.0, 64.0, 32.0]])],
)
def test_unnormalised_boxes_are_refused(boxes):
    with pytest.raises(ValueError, match="`boxes` must be normalised"):
        cell_coverage(boxes, (2, 2))


@pytest.mark.parametrize("boxes", [torch.tensor([0.0, 0.0, 0.5, 0.5]), torch.zeros(2, 3)])
def test_badly_shaped_boxes_are_refused(boxes):
    with pytest.raises(ValueError, match="`boxes`"):
        cell_coverage(boxes, (2, 2))


def test_non_finite_boxes_are_refused():
    with pytest.raises(ValueError, match="boxes"):
        cell_coverage(torch.tensor([[0.0, 0.0, float("nan"), 0.5]]), (2, 2))


# --------------------------------------------------------------------------------------------------------- target


def test_target_is_uniform_over_covered_cells():
    coverage = torch.tensor([1.0, 0.6, 0.4, 0.0])
    torch.testing.assert_close(covered_cells_target(coverage), torch.tensor([0.5, 0.5, 0.0, 0.0]))
    # exactly the threshold counts as covered
    torch.testing.assert_close(covered_cells_target(coverage, 0.4), torch.tensor([1 / 3, 1 / 3, 1 / 3, 0.0]))
    assert DEFAULT_COVERAGE_THRESHOLD == 0.5
    torch.testing.assert_close(covered_cells_target(torch.tensor([0.5, 0.49, 0.0])), torch.tensor([1.0, 0.0, 0.0]))


def test_target_of_a_tiny_box_falls_back_to_its_best_cell_and_no_box_gives_zeros():
    coverage = torch.tensor(
        [
            [0.1, 0.3, 0.2, 0.0],  # nothing reaches 0.5: all mass on the best cell
            [0.2, 0.0, 0.0, 0.2],  # a tie between the best cells shares the mass
            [0.0, 0.0, 0.0, 0.0],  # no box: nothing to ground
            [0.0, 0.7, 0.9, 0.0],
        ]
    )
    expected = torch.tensor(
        [[0.0, 1.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.5], [0.0, 0.0, 0.0, 0.0], [0.0, 0.5, 0.5, 0.0]]
    )
    torch.testing.assert_close(covered_cells_target(coverage), expected)
    # a real tiny box on a 4 x 4 grid: it lies inside cell 5 and covers 1/16 of it
    tiny = cell_coverage(torch.tensor([[0.30, 0.30, 0.3625, 0.3625]]), (4, 4))
    target = covered_cells_target(tiny)
    assert target.sum() == pytest.approx(1.0)
    assert int(target.argmax()) == 5 and float(target[5]) == 1.0


@pytest.mark.parametrize("threshold", [0.0, -0.5, 1.5])
def test_bad_threshold_is_refused(threshold):
    with pytest.raises(ValueError, match="`coverage_threshold`"):
        covered_cells_target(torch.tensor([1.0, 0.0]), threshold)


# ---------------------------------------------------------------------------------------------------------- centre


def test_centre_prior_ranks_cells_by_distance_to_the_centre():
    prior = centre_prior((3, 3))
    assert prior.shape == (9,)
    # minus the rank: the centre first, then the four edge middles, then the corners, ties row-major
    assert prior.tolist() == [-5.0, -1.0, -6.0, -2.0, 0.0, -3.0, -7.0, -4.0, -8.0]
    # an even grid has four equally central cells: the top-left one wins, whatever the argmax does with ties
    prior = centre_prior((4, 4))
    assert int(prior.argmax()) == 5
    assert prior[[5, 6, 9, 10]].tolist() == [0.0, -1.0, -2.0, -3.0]
    assert float(prior[0]) < float(prior[1]) < float(prior[5])
    # a wide grid: distance counts in the image's normalised coordinates
    assert int(centre_prior((2, 5)).argmax()) == 2


@pytest.mark.parametrize("side", [6, 12, 14, 16, 24, 48])
def test_centre_prior_breaks_ties_row_major_on_real_grids(side):
    """Equally far cells must tie exactly (float32 centres do not on a 12 x 12 or a 48 x 48 grid)."""
    prior = centre_prior((side, side))
    # a permutation of 0, -1, ..., -(C - 1)
    assert sorted(prior.tolist()) == [-float(rank) for rank in range(side * side)][::-1]
    middle = (side - 1) // 2
    central = [middle * side + middle, middle * side + middle + 1, (middle + 1) * side + middle, (middle + 1) * side + middle + 1]
    assert prior[central].tolist() == [0.0, -1.0, -2.0, -3.0]


# ------------------------------------------------------------------------------------------------------- geometry


def clip_processor():
    return CLIPImageProcessorPil(size={"shortest_edge": 64}, crop_size={"height": 64, "width": 64})


def siglip_processor():
    return SiglipImageProcessorPil(size={"height": 64, "width": 64})


def vilt_processor():
    return ViltImageProcessorPil(size={"shortest_edge": 64}, size_divisor=16)


def rectangle_image(size: tuple[int, int], box: list[int]) -> Image.Image:
    """A black (width, height) image with a white rectangle on the pixel box x1, y1, x2, y2 (x2, y2 exclusive)."""
    image = Image.new("RGB", size, (0, 0, 0))
    ImageDraw.Draw(image).rectangle([box[0], box[1], box[2] - 1, box[3] - 1], fill=(255, 255, 255))
    return image


def white_extent(pixel_values: torch.Tensor, processor) -> list[int] | None:
    """x1, y1, x2, y2 of the pixels brighter than mid-grey in one processed (3, H, W) image (None: none)."""
    threshold = (0.5 - processor.image_mean[0]) / processor.image_std[0]
    bright = pixel_values[0] > threshold
    if not bright.any():
        return None
    rows, columns = bright.any(1).nonzero()[:, 0], bright.any(0).nonzero()[:, 0]
    return [int(columns.min()), int(rows.min()), int(columns.max()) + 1, int(rows.max()) + 1]


def processed_box(geometry: ImageGeometry, box) -> list[float]:
    """The box in pixels of the processed image."""
    size = torch.tensor([geometry.width, geometry.height] * 2, dtype=torch.float32)
    return (geometry.normalised_boxes(torch.tensor(box, dtype=torch.float32)) * size).tolist()


def test_centre_crop_geometry_on_a_wide_image():
    processor = clip_processor()
    # 256 x 128: the short side goes to 64 (scale 0.5), the 128 x 64 resize is cut to its central 64 x 64
    geometry = ImageGeometry.from_processor(processor, (256, 128), (64, 64))
    assert (geometry.scale_x, geometry.scale_y) == (0.5, 0.5)
    assert (geometry.offset_x, geometry.offset_y) == (32.0, 0.0)
    assert (geometry.width, geometry.height) == (64, 64)
    # the image centre stays the centre; a box in the left quarter, cut away by the crop, shrinks to zero width
    centre = geometry.normalised_boxes(torch.tensor([128.0, 64.0, 128.0, 64.0]))
    torch.testing.assert_close(centre, torch.tensor([0.5, 0.5, 0.5, 0.5]))
    cut = geometry.normalised_boxes(torch.tensor([0.0, 0.0, 48.0, 128.0]))
    torch.testing.assert_close(cut, torch.tensor([0.0, 0.0, 0.0, 1.0]))
    assert cell_coverage(cut[None], (4, 4)).sum() == 0
    # a box across the crop's left edge is clipped to it
    across = geometry.normalised_boxes(torch.tensor([32.0, 32.0, 128.0, 96.0]))
    torch.testing.assert_close(across, torch.tensor([0.0, 0.25, 0.5, 0.75]))


@pytest.mark.parametrize(
    ("original_size", "box"),
    [((256, 128), [112, 32, 176, 96]), ((128, 256), [32, 96, 96, 160]), ((256, 128), [160, 16, 224, 80])],
)
def test_centre_crop_geometry_matches_the_processor(original_size, box):
    processor = clip_processor()
    pixel_values = processor(rectangle_image(original_size, box), return_tensors="pt")["pixel_values"]
    assert tuple(pixel_values.shape[-2:]) == (64, 64)
    geometry = ImageGeometry.from_processor(processor, original_size, (64, 64))
    predicted = processed_box(geometry, box)
    assert white_extent(pixel_values[0], processor) == pytest.approx(predicted, abs=1.0)


def test_centre_crop_geometry_of_a_tall_image_shifts_vertically():
    geometry = ImageGeometry.from_processor(clip_processor(), (128, 256), (64, 64))
    assert (geometry.offset_x, geometry.offset_y) == (0.0, 32.0)
    torch.testing.assert_close(
        geometry.normalised_boxes(torch.tensor([[64.0, 128.0, 64.0, 128.0], [0.0, 0.0, 128.0, 32.0]])),
        torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.0, 0.0, 1.0, 0.0]]),
    )


def test_fixed_resize_geometry_matches_the_processor():
    processor = siglip_processor()
    box = [50, 25, 150, 75]
    pixel_values = processor(rectangle_image((200, 100), box), return_tensors="pt")["pixel_values"]
    assert tuple(pixel_values.shape[-2:]) == (64, 64)
    geometry = ImageGeometry.from_processor(processor, (200, 100), (64, 64))
    assert (geometry.scale_x, geometry.scale_y) == pytest.approx((0.32, 0.64))
    assert (geometry.offset_x, geometry.offset_y) == (0.0, 0.0)
    # both axes are stretched onto the square: the box is the image's central half on each axis
    torch.testing.assert_close(geometry.normalised_boxes(torch.tensor(box, dtype=torch.float32)), torch.tensor([0.25, 0.25, 0.75, 0.75]))
    assert white_extent(pixel_values[0], processor) == pytest.approx(processed_box(geometry, box), abs=1.0)


def test_padded_geometry_uses_the_content_size():
    processor = vilt_processor()
    # ViLT resizes (shortest edge 64, multiples of 16) and pads every image to the batch's largest
    box = [48, 32, 144, 96]
    images = [rectangle_image((192, 128), box), Image.new("RGB", (64, 80))]
    encoded = processor(images, return_tensors="pt")
    pixel_values, pixel_mask = encoded["pixel_values"], encoded["pixel_mask"]
    assert tuple(pixel_values.shape[-2:]) == (80, 96)
    content = (int(pixel_mask[0, 0].sum()), int(pixel_mask[0, :, 0].sum()))
    assert content == (96, 64)
    geometry = ImageGeometry.from_processor(processor, (192, 128), (96, 80), content)
    assert (geometry.width, geometry.height) == (96, 80)
    # normalised to the padded image: the bottom fifth is padding
    torch.testing.assert_close(
        geometry.normalised_boxes(torch.tensor([box, [0, 0, 192, 128]], dtype=torch.float32)),
        torch.tensor([[0.25, 0.2, 0.75, 0.6], [0.0, 0.0, 1.0, 0.8]]),
    )
    assert white_extent(pixel_values[0], processor) == pytest.approx(processed_box(geometry, box), abs=1.0)
    # without the content size the padding would be taken for image: the box would be stretched over it
    unpadded = ImageGeometry.from_processor(processor, (192, 128), (96, 80))
    assert unpadded.normalised_boxes(torch.tensor([0.0, 0.0, 192.0, 128.0])).tolist() == [0.0, 0.0, 1.0, 1.0]


def test_geometry_errors_name_their_argument():
    with pytest.raises(ValueError, match="`original_size`"):
        ImageGeometry.from_processor(siglip_processor(), (0, 10), (64, 64))
    cropping = SiglipImageProcessorPil(size={"height": 64, "width": 64}, do_center_crop=True, crop_size={"height": 32, "width": 32})
    with pytest.raises(ValueError, match="`image_processor`.*shortest_edge"):
        ImageGeometry.from_processor(cropping, (100, 100), (32, 32))
    geometry = ImageGeometry.from_processor(siglip_processor(), (64, 64), (64, 64))
    with pytest.raises(ValueError, match="`boxes`"):
        geometry.normalised_boxes(torch.zeros(2, 3))
