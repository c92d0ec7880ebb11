"""Thin reward functions for other trainers that call the reward service (`cli.serve`): TRL's `reward_funcs`
(`clients.trl`, sync and `async def`) and verl's `custom_reward_function` (`clients.verl`), over one HTTP client with
retries and the token (`clients.http`, and `clients.async_http` for asyncio). They send raw questions, so start the
service with `--no-chat-template`."""
