"""The caption_scores evaluate module (a package only so that wheels ship the script)."""
