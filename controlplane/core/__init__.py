"""The pure allocation core: policies and the arithmetic of dividing a budget. No I/O."""
