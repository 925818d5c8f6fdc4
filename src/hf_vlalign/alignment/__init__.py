from .boxes import alignment_target, box_area, box_iou, gold_region_iou, normalize_boxes

__all__ = ["alignment_target", "box_area", "box_iou", "gold_region_iou", "normalize_boxes"]
