"""djl_handlers.params"""
