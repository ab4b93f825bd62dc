"""djl_handlers.engines"""
