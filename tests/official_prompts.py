"""The official prompt rules and Emu3's layout constraint, re-created from the official code (not imported from
the pack), for the tests to compare the pack's prompts and tokens against.

- Janus-Pro: deepseek-ai/Janus generation_inference.py;
- Emu3-Gen: baaivision/Emu3 image_generation.py with emu3/mllm/processing_emu3.py (Emu3Processor.__call__,
  mode 'G') and emu3/mllm/utils_emu3.py (Emu3PrefixConstrainedLogitsHelper).
"""
from __future__ import annotations

# ---- Janus-Pro ---------------------------------------------------------------------------------------------------
JANUS_IMAGE_START = "<begin_of_image>"  # janus/models/processing_vlm.py: image_start_tag


def official_janus_prompt(text: str, image_start: str = JANUS_IMAGE_START) -> str:
    """generation_inference.py: the conversation [User: text, Assistant: ""] through
    apply_sft_template_for_multi_turn_prompts (processing_vlm.py: each message .strip()ped, the whole prompt
    .strip()ped) with the "deepseek" template (conversation.py, SeparatorStyle.DeepSeek: sep "\\n\\n", an empty
    message writes the bare role and colon, system prompt ""), then image_start_tag; the ids are
    tokenizer.encode(prompt), BOS first."""
    seps, out = ["\n\n", "<｜end▁of▁sentence｜>"], ""
    for i, (role, message) in enumerate([("<|User|>", text.strip()), ("<|Assistant|>", "")]):
        out += f"{role}: {message}{seps[i % 2]}" if message else f"{role}:"
    return out.strip() + image_start


# ---- Emu3-Gen ----------------------------------------------------------------------------------------------------
# image_generation.py: POSITIVE_PROMPT is appended to every prompt; NEGATIVE_PROMPT is the unconditional row's text
OFFICIAL_POSITIVE = " masterpiece, film grained, best quality."
OFFICIAL_NEGATIVE = ("lowres, bad anatomy, bad hands, text, error, missing fingers, extra digit, fewer digits, "
                     "cropped, worst quality, low quality, normal quality, jpeg artifacts, signature, watermark, "
                     "username, blurry.")
# tokenization_emu3.py's names of the image marks (boi_token, img_token); the HF release's tokenizer calls the
# second image_wrapper_token
EMU3_BOI, EMU3_IMG = "<|image start|>", "<|image token|>"


def official_ids(tok, text, grid):
    """Emu3Processor.__call__ (mode 'G'): bos_token + text + boi_token + f"{h}*{w}" + img_token, tokenized as
    one string; the marks are the tokenizer's own (boi_token, image_wrapper_token) where it defines them."""
    h, w = grid
    boi = getattr(tok, "boi_token", None) or EMU3_BOI
    img = getattr(tok, "image_wrapper_token", None) or EMU3_IMG
    return tok(tok.bos_token + text + boi + f"{h}*{w}" + img, add_special_tokens=False)["input_ids"]


class Emu3LayoutConstraint:
    """Emu3PrefixConstrainedLogitsHelper (utils_emu3.py), re-created: the tokens allowed after a prefix, from the
    offset past the first image-wrapper token: a row end every W + 1, then end-of-frame, image end, EOS, then
    pad; visual tokens otherwise. Ids from the tokenizer, as Emu3Processor.build_const_helper reads them; the
    visual tokens are the contiguous range from visual token 0 to the last code's."""

    def __init__(self, tok, grid, codes: int):
        ids = tok.convert_tokens_to_ids
        self.height, self.width = grid
        self.img = ids(getattr(tok, "image_wrapper_token", None) or EMU3_IMG)
        self.eol, self.eof = ids("<|extra_200|>"), ids("<|extra_201|>")
        self.eoi, self.eos, self.pad = ids("<|image end|>"), tok.eos_token_id, tok.pad_token_id
        first, last = ids("<|visual token 000000|>"), ids(f"<|visual token {codes - 1:06d}|>")
        self.visual = list(range(first, last + 1))
        self.start = {}

    def __call__(self, batch_id, input_ids):
        if batch_id not in self.start:
            self.start[batch_id] = int((input_ids == self.img).nonzero()[0, 0])
        offset, end = input_ids.shape[0] - self.start[batch_id], (self.width + 1) * self.height
        if offset % (self.width + 1) == 0:  # checked first, as the original does
            return [self.eol]
        tail = {end + 1: self.eof, end + 2: self.eoi, end + 3: self.eos}
        if offset in tail:
            return [tail[offset]]
        return [self.pad] if offset > end + 3 else self.visual
