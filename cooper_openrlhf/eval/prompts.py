"""The evaluation prompt: the question plus an answer-format instruction, as chat messages.

The paper evaluates with the model's chat template and asks for the final answer in
``\\boxed{}`` (the instruction Qwen2.5-Math's evaluation uses for chain-of-thought). The
instruction sits in the user turn, so chat templates without a system role render it too.
Engines render the messages with the model's own template (`engines.base.prompt_token_ids`).
"""

ANSWER_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."


def build_messages(question: str, instruction: str = ANSWER_INSTRUCTION) -> list[dict[str, str]]:
    """[{"role": "user", "content": question + blank line + instruction}] for one question."""
    if not isinstance(question, str) or not question.strip():
        raise ValueError("question must be a non-empty string")
    content = f"{question.strip()}\n\n{instruction}" if instruction else question.strip()
    return [{"role": "user", "content": content}]
